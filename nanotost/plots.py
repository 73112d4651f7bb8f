"""
matplotlib for files: every figure of the project (the white-box pictures, the studies' figures)
is drawn through pyplot() here.
"""


def pyplot():
    """matplotlib.pyplot for drawing into files (the Agg backend: no display needed), with text
    drawn as given: mathtext off, so a `$` in a path, a prompt, a token or a name is a dollar
    sign, never the start of a formula that fails to parse after all the work. Every figure of
    the project is drawn through this."""
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt
    return plt
