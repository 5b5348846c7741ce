import sys

from metroline.cli import main

sys.exit(main())
