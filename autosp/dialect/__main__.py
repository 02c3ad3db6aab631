"""``python -m autosp.dialect`` prints the path of the dialect's IRDL file."""
from autosp.dialect import IRDL_FILE

print(IRDL_FILE)
