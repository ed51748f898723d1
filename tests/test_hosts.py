"""CPU hosts are told apart by what measured them: the catalog entry of a CPU host names its cpu_model and vector
ISA, collect names its rows after it, and rows collected before that are re-pointed at read time from their own
hardware_fingerprint (core.dataset.on_measuring_host). The probes of one host must never time another's steps."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from perfpredict.core.catalog import cpu_hardware_for, cpu_names, get_gpu, gpu_catalog
from perfpredict.core.dataset import on_measuring_host, read_tables

DATA = Path(__file__).resolve().parents[1] / "datasets"
XEON = {"device": "cpu", "cpu_model": "Intel(R) Xeon(R) Processor", "cpu_flags": ["avx2", "avx512f", "fma"]}
EPYC = {"device": "cpu", "cpu_model": "AMD EPYC", "cpu_flags": ["fma", "avx2"]}
AMX = {"device": "cpu", "cpu_model": "Intel(R) Xeon(R) Processor",
       "cpu_flags": ["amx_bf16", "amx_tile", "avx2", "avx512_bf16", "avx512_fp16", "avx512f", "fma"]}


def test_fingerprints_map_to_their_own_entry():
    assert cpu_hardware_for(XEON) == "cpu"
    assert cpu_hardware_for(EPYC) == "cpu-epyc-avx2"
    assert cpu_hardware_for(AMX) is None  # no probes from that host: no entry
    assert cpu_hardware_for({"device": "cuda", "cpu_model": "AMD EPYC", "cpu_flags": ["avx2", "fma"]}) is None


@pytest.mark.parametrize("name", sorted(cpu_names()))
def test_every_cpu_entry_names_its_host(name):
    g = get_gpu(name)
    assert g.host_cpu_model and g.host_isa, f"{name}: CPU entries must say which host they describe"
    others = [n for n, o in gpu_catalog().items() if n != name and o.is_cpu]
    assert all((get_gpu(o).host_cpu_model, get_gpu(o).host_isa) != (g.host_cpu_model, g.host_isa) for o in others)


def test_rows_are_renamed_with_their_figures():
    row = {"hardware": "cpu", "hardware_fingerprint": json.dumps(EPYC), "g_name": "cpu", "g_fp32_tflops": 0.346,
           "c_intra_bw_gb_per_s": 0.82}
    other = {**row, "hardware_fingerprint": json.dumps(AMX)}
    out = on_measuring_host(pl.DataFrame([row, other]))
    g = get_gpu("cpu-epyc-avx2")
    assert out.row(0, named=True) == {**row, "hardware": g.name, "g_name": g.name, "g_fp32_tflops": g.fp32_tflops,
                                      "c_intra_bw_gb_per_s": g.intra_node_bw_gb_per_s}
    assert out.row(1, named=True) == other  # a host without an entry keeps what it says


def test_committed_cpu_probes_each_come_from_the_host_their_name_describes():
    probes = read_tables(DATA, "probes")
    if probes.is_empty():
        pytest.skip("no probes committed")
    cpu = probes.filter(pl.col("hardware").is_in(sorted(cpu_names())))
    for (name,), g in cpu.group_by("hardware"):
        hosts = {cpu_hardware_for(json.loads(fp)) for fp in g["hardware_fingerprint"].unique().to_list()}
        assert hosts == {name}, f"{name} probes come from {hosts}"
