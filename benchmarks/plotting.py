"""Plotting backend shared by the benchmarks (matplotlib comes with the ``bench`` extra)."""


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (PNG files, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
