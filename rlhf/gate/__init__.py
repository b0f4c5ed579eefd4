"""The promotion gate: a candidate policy against its parent on held-out questions."""
