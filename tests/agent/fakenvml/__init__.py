"""A fake ``libnvidia-ml.so.1`` (``fakenvml.c``) built with the system C compiler, and its description.

The real pynvml loads it (in-process through ``PynvmlBackend(library_path=...)``, in a child process
through ``LD_LIBRARY_PATH`` exactly as on a node), so the adapter's ctypes structs, symbol lookups
and error codes run for real. One build per driver generation, each exporting the symbols that
generation has; builds are cached under the user's cache directory, keyed by the source's hash.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).with_name("fakenvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
GIB = 2**30
MIB = 2**20


@dataclass(frozen=True)
class DriverVariant:
    """One NVIDIA driver generation: its version strings and the calls it exports."""

    name: str
    driver: str
    cuda: int
    defines: tuple[str, ...]
    process_call: str
    """The running-processes call the agent should end up using on this driver."""
    has_instance_ids: bool = True


VARIANTS: dict[str, DriverVariant] = {
    v.name: v
    for v in (
        DriverVariant("r470", "470.256.02", 11040, (), "nvmlDeviceGetComputeRunningProcesses", False),
        DriverVariant("r535", "535.54.03", 12020, ("MEM_V2", "PROC_V2", "PROC_V3", "PROC_V3_CC"),
                      "nvmlDeviceGetComputeRunningProcesses_v3"),
        DriverVariant("r535-late", "535.104.05", 12020, ("MEM_V2", "PROC_V2", "PROC_V3"),
                      "nvmlDeviceGetComputeRunningProcesses_v3"),
        DriverVariant("r550", "550.127.05", 12040, ("MEM_V2", "PROC_V2", "PROC_DETAIL"),
                      "nvmlDeviceGetRunningProcessDetailList"),
        DriverVariant("r580", "580.65.06", 13000, ("MEM_V2", "PROC_V2", "PROC_DETAIL"),
                      "nvmlDeviceGetRunningProcessDetailList"),
    )
}


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpulens" / "fakenvml"


def build(variant: DriverVariant) -> Path:
    """The directory holding this variant's ``libnvidia-ml.so.1`` (compiled once, then cached)."""
    digest = hashlib.sha256(SOURCE.read_bytes() + repr(variant.defines).encode()).hexdigest()[:16]
    out_dir = _cache_root() / f"{variant.name}-{digest}"
    library = out_dir / LIBRARY_NAME
    if library.exists():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) found: the fake NVML library cannot be built")
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        partial = Path(tmp) / LIBRARY_NAME
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wno-format-truncation",
             *(f"-D{d}" for d in variant.defines), "-o", str(partial), str(SOURCE), "-lpthread"],
            check=True, capture_output=True, text=True,
        )
        partial.replace(library)  # atomic: a parallel build never sees half a file
    return out_dir


# ------------------------------------------------------------------ the description


@dataclass(frozen=True)
class Gpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    mem_total: int = 80 * GIB
    mem_used: int = 10 * GIB
    mem_reserved: int = 0
    """What the driver keeps for itself: used to the unversioned memory call, apart to ``_v2``."""
    util_gpu: int = 50
    util_mem: int = 20
    power_mw: int = 250_000
    temp_c: int = 55
    sm_mhz: int = 1410
    mem_mhz: int = 1593
    pcie_tx_kbs: int = 1000
    pcie_rx_kbs: int = 2000
    nvlink_tx_kib: int = 4096
    nvlink_rx_kib: int = 8192
    mig_mode: int | None = 0
    """1 enabled, 0 disabled, None: the GPU cannot do MIG (NOT_SUPPORTED)."""
    unsupported: tuple[str, ...] = ()
    """Fields answering NOT_SUPPORTED: power, temperature, clock, pcie, nvlink, utilization,
    process_utilization, events, processes, memory, name; memory_v2 (``_v2`` only), and
    memory_v2_version (``_v2`` answers ARGUMENT_VERSION_MISMATCH)."""
    lost_after: int = 0
    """Once the GPU's handle was opened this many times, every call answers GPU_IS_LOST (0: never)."""


@dataclass(frozen=True)
class Mig:
    uuid: str
    parent: str
    profile: str
    gi: int
    ci: int
    mem_total: int
    mem_used: int
    start: int | str | None = None
    """The GPU instance's placement start, or "denied" (NO_PERMISSION); None: NOT_SUPPORTED."""


@dataclass(frozen=True)
class Process:
    pid: int
    device: str
    mem: int | None
    """Bytes; None: NVML reports "not available"."""
    sm_pct: int = 0


@dataclass(frozen=True)
class Xid:
    xid: int
    device: str
    after: int = 1
    """Raised when the GPU's handle is opened the ``after``-th time (one open per sample)."""


@dataclass(frozen=True)
class Node:
    variant: DriverVariant
    gpus: list[Gpu]
    migs: list[Mig] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    xids: list[Xid] = field(default_factory=list)
    init_error: int = 0

    def render(self) -> str:
        lines = [f"driver={self.variant.driver};cuda={self.variant.cuda}"]
        if self.init_error:
            lines.append(f"init_error={self.init_error}")
        for g in self.gpus:
            mig = "na" if g.mig_mode is None else str(g.mig_mode)
            lines.append(
                f"gpu={g.uuid};name={g.name};mem_total={g.mem_total};mem_used={g.mem_used};"
                f"mem_reserved={g.mem_reserved};util_gpu={g.util_gpu};util_mem={g.util_mem};power_mw={g.power_mw};"
                f"temp_c={g.temp_c};sm_mhz={g.sm_mhz};"
                f"mem_mhz={g.mem_mhz};pcie_tx_kbs={g.pcie_tx_kbs};pcie_rx_kbs={g.pcie_rx_kbs};"
                f"nvlink_tx_kib={g.nvlink_tx_kib};nvlink_rx_kib={g.nvlink_rx_kib};mig_mode={mig};"
                f"unsupported={','.join(g.unsupported)};lost_after={g.lost_after}"
            )
        for m in self.migs:
            parent = next(g for g in self.gpus if g.uuid == m.parent)
            lines.append(
                f"mig={m.uuid};parent={m.parent};name={parent.name} MIG {m.profile};gi={m.gi};ci={m.ci};"
                f"mem_total={m.mem_total};mem_used={m.mem_used}" + ("" if m.start is None else f";start={m.start}")
            )
        for p in self.processes:
            lines.append(f"proc={p.pid};device={p.device};mem={'na' if p.mem is None else p.mem};sm={p.sm_pct}")
        for x in self.xids:
            lines.append(f"xid={x.xid};device={x.device};after={x.after}")
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> Path:
        path.write_text(self.render())
        return path

    def environment(self, config: Path) -> dict[str, str]:
        """What a child process needs to load this node's library as ``libnvidia-ml.so.1``."""
        library_dir = build(self.variant)
        path = os.environ.get("LD_LIBRARY_PATH")
        return {
            "LD_LIBRARY_PATH": f"{library_dir}:{path}" if path else str(library_dir),
            "FAKE_NVML_CONFIG": str(self.write(config)),
        }


def gpu_uuid(n: int) -> str:
    return f"GPU-{n:08x}-7a2c-4f1e-9d3b-{n:012x}"


def mig_uuid(n: int) -> str:
    return f"MIG-{n:08x}-1b2c-5d6e-8f90-{n:012x}"


def standard_node(variant: DriverVariant) -> Node:
    """Two GPUs with two processes each; on R550+ a third GPU in MIG mode with two instances.

    The first GPU's driver keeps 616 MiB for itself, as an H200's did on 580.159.04.

    Two processes a GPU make a wrong struct stride visible (the second PID would be garbage).
    """
    gpus = [Gpu(gpu_uuid(0), mem_reserved=616 * MIB),
            Gpu(gpu_uuid(1), name="Tesla T4", mig_mode=None, mem_total=16 * GIB, unsupported=("nvlink",))]
    processes = [
        Process(1101, gpu_uuid(0), 3 * GIB, sm_pct=40),
        Process(1102, gpu_uuid(0), 5 * GIB, sm_pct=10),
        Process(1201, gpu_uuid(1), 2 * GIB, sm_pct=70),
        Process(1202, gpu_uuid(1), None),
    ]
    migs: list[Mig] = []
    if variant.name in ("r550", "r580"):
        gpus.append(Gpu(gpu_uuid(2), name="NVIDIA H100 80GB HBM3", mig_mode=1))
        migs = [Mig(mig_uuid(1), gpu_uuid(2), "3g.40gb", 1, 0, 40 * GIB, 12 * GIB, start=4),
                Mig(mig_uuid(2), gpu_uuid(2), "1g.10gb", 9, 0, 10 * GIB, 1 * GIB, start="denied")]
        processes += [Process(1301, mig_uuid(1), 11 * GIB), Process(1302, mig_uuid(2), GIB // 2)]
    return Node(variant, gpus, migs, processes)
