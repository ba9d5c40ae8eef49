"""``python -m stitchcuda.cli``, as the ``stitchcuda`` command."""

from stitchcuda.cli import main

main()
