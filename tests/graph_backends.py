"""``torch.compile`` backends that stand in on CPU for a CUDA-graph backend (``reduce-overhead``):
``Captures`` counts the graphs a card would capture, ``Replays`` also overwrites a graph's earlier
outputs the way a replay does."""

from __future__ import annotations

import weakref

import torch


class Captures:
    """A ``torch.compile`` backend that counts what a CUDA-graph backend (``reduce-overhead``)
    would do: ``compiles``, each new graph dynamo hands over, and ``captures``, each distinct set
    of addresses of the graph's static inputs (parameters, buffers and tensors marked static, such
    as the KV cache) it is called with, since CUDA-graph trees capture a graph again when one of
    those addresses changes. Runs the graph eagerly (``_runner``)."""

    def __init__(self) -> None:
        self.compiles = 0
        self.addresses: set = set()

    @property
    def captures(self) -> int:
        return len(self.addresses)

    def _runner(self, gm, inputs):
        """What runs the graph ``gm`` dynamo hands over: its own ``forward``."""
        return gm.forward

    def __call__(self, gm, inputs):
        self.compiles += 1
        static = [
            i
            for i, t in enumerate(inputs)
            if isinstance(t, torch.nn.Parameter) or hasattr(t, "_dynamo_static_input_type")
        ]
        graph = self.compiles
        runner = self._runner(gm, inputs)

        def run(*args):
            self.addresses.add((graph, *(args[i].data_ptr() for i in static)))
            return runner(*args)

        return run


class Replays(Captures):
    """``Captures`` that also does on CPU what CUDA-graph trees do where a training step can go
    wrong under them: AOTAutograd splits each graph into a forward and a backward, and when a
    forward runs again (the next step), every tensor the earlier forwards and backwards returned is
    overwritten with NaN, as a replay writes its outputs into the memory of the last replay's
    (tensors that share an input's memory, such as a parameter's view, are the input's, not the
    graph's, and are left alone). The graphs run eagerly."""

    def __init__(self) -> None:
        super().__init__()
        self._returned: list = []  # weak references to the outputs since the last forward

    def _overwrite(self) -> None:
        with torch.no_grad():
            for ref in self._returned:
                t = ref()
                if t is not None:
                    t.fill_(float("nan"))
        self._returned = []

    def _compiler(self, forward: bool):
        from torch.fx.graph import _BoxedCodeGen

        def compile_(gm, example_inputs):
            gm.graph.set_codegen(_BoxedCodeGen())
            gm.recompile()

            def run(args):
                if forward:
                    self._overwrite()
                inputs = {
                    a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)
                }
                outputs = gm.forward(args)
                self._returned += [
                    weakref.ref(t)
                    for t in outputs
                    if isinstance(t, torch.Tensor)
                    and t.is_floating_point()
                    and t.untyped_storage().data_ptr() not in inputs
                ]
                return outputs

            run._boxed_call = True
            return run

        return compile_

    def _runner(self, gm, inputs):
        from torch._dynamo.backends.common import aot_autograd

        return aot_autograd(fw_compiler=self._compiler(True), bw_compiler=self._compiler(False))(
            gm, inputs
        )
