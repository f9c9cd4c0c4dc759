"""Print the version of MaxText this Python has installed, or `none`."""

import importlib.metadata

if __name__ == "__main__":
    try:
        print(importlib.metadata.version("maxtext"))
    except importlib.metadata.PackageNotFoundError:
        print("none")
