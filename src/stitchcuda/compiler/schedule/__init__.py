"""Stage 3, scheduling: fusion groups (fusion.py over roles.py's operator roles and grouping.py's
incremental bookkeeping), formed only where a lowering accepts them (it asks the lowering
registry), and the graph rewrites the driver makes when it splits a group (rewrite.py)."""
