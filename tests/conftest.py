import os
import sys

# the toy-model catalogue is imported by several test files as `models`
sys.path.insert(0, os.path.dirname(__file__))
