from pathlib import Path

MODALS_TCSS = Path(__file__).with_name("modals.tcss")
