"""The installed distribution's version, importable from anywhere without importing the package."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("autoplace")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"
