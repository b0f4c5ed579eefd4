"""Ratings: every kind of rating a rater gives an answer, defined once, with their validation and
their writes, for the chat page, the /v1 API, the importers, the feedback browser and the exports.

The modules, by role: ``kind`` (what a rating kind is), one module per kind of the feedback row
(``thumb``, ``stars``, ``correction``, ``comment``, ``reasons``), ``flag`` (the one kind with a row
of its own), ``registry`` (the kinds in use, and everything that walks them) and ``store`` (the two
upserts). Import from the module that defines a name: this file imports nothing, so that
webapp.core.models can take a kind's values without a cycle.
"""
