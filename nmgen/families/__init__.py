"""Kernel families: the interface (``base``), the launch plan as data (``plan``), search
spaces (``space``), the registry, and one sub-package a family."""
