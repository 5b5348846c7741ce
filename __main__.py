import sys

from metroline.cli import main

if __name__ == "__main__":  # not when a spawned replica process (`serve --replicas`) imports it
    sys.exit(main())
