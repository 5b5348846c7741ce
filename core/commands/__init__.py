"""The bodies of the `metroline` commands, one module each; `cli.py` parses the command line and
calls them. `options` merges a config file and the flags; `flags` declares them."""
