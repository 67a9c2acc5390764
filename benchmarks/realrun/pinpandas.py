"""pinpandas.py: pip-install pandas<3 into this python when its pandas is 3 or later (pandas 3's
copy-on-write makes `df[col].values[:] = 0` raise 'assignment destination is read-only')."""
import subprocess
import sys

import pandas

if int(pandas.__version__.split(".")[0]) >= 3:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "pandas<3"])
print("pandas", pandas.__version__, "(before)")
