"""One module per context-recall variant, named by its catalog key.

Each module holds the whole variant: the scorer class (``SCORER``), and for a judge-based
variant its judge tasks (``TASKS``: prompt and answer schema) and their parsers. Adding a
variant means adding its module here and its row to :mod:`recalltrace.scorers.catalog`.
"""
