"""Feedback as data: the records the app hands over, the rating criteria, the synthetic corpus,
personal-data redaction, the TRL datasets built from feedback and the sizing of each stage."""
