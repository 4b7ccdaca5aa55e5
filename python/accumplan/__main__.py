"""python -m accumplan plan|export|report ...: the executable's planner commands (_core.main: its code, messages)."""
import os
import sys

from . import _core

if __name__ == "__main__":
    # As bytes: an argument that is not UTF-8 (a file name) reaches the commands as the OS gave it.
    sys.exit(_core.main([os.fsencode(a) for a in sys.argv[1:]]))
