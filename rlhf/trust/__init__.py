"""Rater trust: how much each rater's feedback counts, estimated from agreement between raters."""
