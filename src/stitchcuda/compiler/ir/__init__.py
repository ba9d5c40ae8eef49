"""Stage 2, IR: what every later stage speaks. expr.py's expressions and programs (views as
strided reads, gathers, row steps), formulas.py's operator formulas, ops.py's operator classes,
group.py's fusion-group record, and evaluate.py (the IR run on the CPU, for tests)."""
