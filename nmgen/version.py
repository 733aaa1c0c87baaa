"""The nmgen version, stamped into every generated kernel's header."""

__version__ = "0.2.0"
