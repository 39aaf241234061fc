"""See batching happen: a static-vs-continuous simulator and step-through viewers.

* :mod:`inflight.sim.simulator`: the discrete-step model; its docstring defines
  steps (counted as steps done, like the explainers), start/finish/wait,
  hand-back and utilisation exactly.
* :mod:`inflight.sim.report`: the text table and the ``--json`` document.
* :mod:`inflight.sim.examples`: the explainers' worked examples (``--example``).
* :mod:`inflight.sim.trace`: engine ``--trace-file`` JSON lines.
* :mod:`inflight.sim.views`: both turned into one renderer-neutral Page.
* :mod:`inflight.sim.render`: a Page as self-contained HTML or a matplotlib PNG.
* :mod:`inflight.sim.cli`: ``inflight simulate`` and ``inflight trace view``.

Pure Python: nothing here imports torch; matplotlib is imported only to draw PNGs.
"""
from inflight.sim.simulator import (SimResult, Workload, random_workload, simulate,
                                    simulate_continuous, simulate_static)

__all__ = ["SimResult", "Workload", "random_workload", "simulate",
           "simulate_continuous", "simulate_static"]
