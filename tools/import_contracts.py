"""The ``strict_layers`` import contract: layers across root packages that cover every module and hold no cycle.

Registered in ``.importlinter`` (``contract_types = strict_layers: tools.import_contracts.StrictLayersContract``).
It is import-linter's ``layers`` contract (same options, same checks of the direction of imports) with two
options that import-linter 2.x offers only for layers repeated in ``containers``, or not at all:

``exhaustive = true`` (without ``containers``)
    Every module of the root packages lies in a layer: it is a module named in ``layers`` or inside one. A
    package that only holds layers, such as ``costs`` when ``costs.api`` and ``costs.models`` are layers, needs
    no layer of its own as long as its ``__init__`` imports nothing. ``exhaustive_ignores`` lists modules (full
    dotted names, with what is inside them) left out on purpose. With ``containers`` the option keeps
    import-linter's meaning (every child of every container is a layer).

``acyclic = true``
    No two modules of the root packages import each other, directly or through others. Across layers imports
    only go down, and between independent siblings (``|``) not at all, so this is what rules out a cycle
    inside one layer's module (inside ``jobs``, say).
"""

from __future__ import annotations

import networkx as nx
from grimp import ImportGraph
from importlinter.application import output
from importlinter.contracts.layers import LayersContract
from importlinter.domain import fields
from importlinter.domain.contract import ContractCheck


def _inside(module: str, names) -> bool:
    """Whether ``module`` is one of the dotted ``names`` or inside one of them."""
    return any(module == name or module.startswith(name + ".") for name in names)


def import_cycles(graph: ImportGraph, modules: set[str]) -> list[list[str]]:
    """The import cycles among ``modules`` (dotted names in ``graph``): one cycle of each strongly connected component
    of two or more modules, as the list of its modules, each importing the next and the last the first, starting
    at its first module in sorted order. Sorted; ``[]`` when the modules import each other in no cycle."""
    directed = nx.DiGraph()
    directed.add_nodes_from(modules)
    directed.add_edges_from((importer, imported) for importer in modules
                            for imported in graph.find_modules_directly_imported_by(importer) if imported in modules)
    cycles = []
    for component in nx.strongly_connected_components(directed):
        if len(component) < 2:
            continue
        cycle = [importer for importer, _ in nx.find_cycle(directed.subgraph(component), source=min(component))]
        first = cycle.index(min(cycle))
        cycles.append(cycle[first:] + cycle[:first])
    return sorted(cycles)


class StrictLayersContract(LayersContract):
    """import-linter's ``layers`` contract plus ``exhaustive`` without containers and ``acyclic`` (module docstring).

    A broken contract's check metadata holds, besides the layers contract's, ``outside_layers`` (sorted module
    names in no layer) and ``import_cycles`` (``import_cycles``' result).
    """

    type_name = "strict_layers"

    acyclic = fields.BooleanField(default=False)

    def validate(self) -> None:
        if self.containers or not self.exhaustive:
            return super().validate()
        # import-linter refuses ``exhaustive`` without containers; this contract gives it a meaning there.
        self.exhaustive = False
        try:
            super().validate()
        finally:
            self.exhaustive = True

    def _root_modules(self, graph: ImportGraph) -> set[str]:
        roots = self.session_options["root_packages"]
        return {module for root in roots for module in {root, *graph.find_descendants(root)}}

    def _outside_layers(self, graph: ImportGraph, modules: set[str]) -> set[str]:
        layered = {tail.name for tail in self._get_all_module_tails_from_layers(self.layers)}  # type: ignore[arg-type]
        ignored = set(self.exhaustive_ignores or ())  # type: ignore[arg-type]
        return {
            module for module in modules
            if not _inside(module, layered | ignored)
            and not (any(name.startswith(module + ".") for name in layered)
                     and not graph.find_modules_directly_imported_by(module))
        }

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        check = super().check(graph, verbose)  # removes the ignored imports from ``graph`` first
        modules = self._root_modules(graph)
        outside = self._outside_layers(graph, modules) if self.exhaustive and not self.containers else set()
        cycles = import_cycles(graph, modules) if self.acyclic else []
        check.metadata.update(outside_layers=sorted(outside), import_cycles=cycles)
        check.kept = check.kept and not outside and not cycles
        return check

    def render_broken_contract(self, check: ContractCheck) -> None:
        super().render_broken_contract(check)
        if check.metadata["outside_layers"]:
            output.print("These modules are in no layer (the contract is exhaustive: every module is in one):")
            output.new_line()
            for module in check.metadata["outside_layers"]:
                output.print_error(f"- {module}", bold=False)
            output.new_line()
        for cycle in check.metadata["import_cycles"]:
            output.print("These modules import each other in a cycle:")
            output.new_line()
            output.print_error(" -> ".join([*cycle, cycle[0]]), bold=False)
            output.new_line()
