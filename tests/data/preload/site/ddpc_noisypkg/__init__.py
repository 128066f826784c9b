"""A package that talks at import: Python-level print and raw writes to fds 1 and 2."""

import os
import sys

print("noisypkg says hello on stdout")
sys.stdout.flush()
os.write(1, b"noisypkg raw fd 1\n")
os.write(2, b"noisypkg raw fd 2\n")
