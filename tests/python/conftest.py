import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import rndv_env  # noqa: E402

rndv_env.apply()
