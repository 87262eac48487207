"""Model export formats per task: signature checks (for ``auto``), preprocessing defaults, decoders."""
