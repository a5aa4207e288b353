"""Puts tests/ on the path for volt_testkit (free_port, require), shared with the other folders."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
