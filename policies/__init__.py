"""The shipped policies, one module each, each a plain pluggy plugin class."""
