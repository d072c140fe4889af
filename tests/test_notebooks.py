"""Research notebooks are part of the product: each must execute top to bottom on a fresh kernel and check its
key results with assertions (a failing assertion fails the test, like any other error in a cell)."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook tests need the dev extras (nbformat, nbclient)")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need the dev extras (nbformat, nbclient)")

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def execute(notebook: nbformat.NotebookNode, where: Path) -> None:
    """Run every cell in a fresh kernel started in `where`; the first cell that raises stops the run and raises."""
    nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(where)}}
    ).execute()


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_checks_its_results(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    code = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    assert any(line.lstrip().startswith("assert ") for src in code for line in src.splitlines()), (
        f"{path.name} asserts none of its results"
    )
    execute(notebook, path.parent)
    errors = [
        out
        for cell in notebook.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors


def test_a_failing_assertion_cell_fails_the_run(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("cycles = {'fused': 5, 'unfused': 4}"),
            nbformat.v4.new_code_cell("assert cycles['fused'] < cycles['unfused'], 'fusion saves cycles'"),
            nbformat.v4.new_code_cell("print('never reached')"),
        ]
    )
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="fusion saves cycles"):
        execute(notebook, tmp_path)
    assert not notebook.cells[2].get("outputs")
