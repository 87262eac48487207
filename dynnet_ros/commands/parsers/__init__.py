"""Every sub-command's arguments, apart from its implementation.

``parsers/NAME.py`` defines ``NAME``, ``HELP`` and ``add_arguments(parser)`` for the command
whose ``run(args) -> int`` is ``commands/NAME.py``. The CLI builds a command's parser from here
and imports the implementation only to run it, so ``dynnet CMD --help`` and argument errors load
none of the command's machinery (onnxruntime, the mapper's search, ROS, the bag library). A parser
module imports only the standard library, numpy and the package's light modules.
"""
