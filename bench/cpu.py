"""The CPU a benchmark runs on, and the environments that are valid on it.

Every bench script prints cpu.banner() before its figures, so each figure
has its CPU beside it. torch_envs() lists only the OpenBLAS core types this
CPU can execute: OPENBLAS_CORETYPE=SkylakeX on a CPU without AVX-512 kills
PyTorch with SIGILL.
"""
import json, os

# OpenBLAS core type: the cpuinfo flags its kernels execute.
OPENBLAS_CORES = [
    ("SkylakeX", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    ("Haswell", {"avx2", "fma"}),
]


def info():
    """name, vendor, family, model and flags of the first processor."""
    d = {"name": "unknown CPU", "vendor": "", "family": 0, "model": 0, "flags": set()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                k, _, v = (s.strip() for s in line.partition(":"))
                if k == "model name":
                    d["name"] = v
                elif k == "vendor_id":
                    d["vendor"] = v
                elif k == "cpu family":
                    d["family"] = int(v)
                elif k == "model":
                    d["model"] = int(v)
                elif k == "flags":
                    d["flags"] = set(v.split())
    except OSError:
        pass
    return d


def isa(flags=None):
    """The widest of dtrain's instruction-set levels (dtrain --version) the CPU has."""
    f = info()["flags"] if flags is None else flags
    if {"amx_tile", "amx_bf16"} <= f:
        return "amx"
    if "avx512_bf16" in f:
        return "avx512_bf16"
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= f:
        return "avx512"
    return "avx2" if {"avx2", "fma"} <= f else "base"


def banner(as_json=False):
    d = info()
    desc = {"cpu": d["name"], "vendor": d["vendor"], "family": d["family"], "model": d["model"],
            "isa": isa(d["flags"]), "cores": os.cpu_count(), "load": round(os.getloadavg()[0], 2)}
    if as_json:
        return json.dumps(desc)
    return ("# CPU: %(cpu)s (%(vendor)s family %(family)d model %(model)d, %(isa)s), %(cores)d cores, "
            "load average %(load).2f at the start" % desc)


def torch_envs(passive_only=False):
    """The environments PyTorch is tried under: its defaults (unless
    passive_only), a passive OpenMP wait policy, and each OpenBLAS core type
    this CPU can run."""
    flags = info()["flags"]
    envs = [] if passive_only else [{}]
    envs.append({"OMP_WAIT_POLICY": "passive"})
    envs += [{"OPENBLAS_CORETYPE": name, "OMP_WAIT_POLICY": "passive"}
             for name, need in OPENBLAS_CORES if need <= flags]
    return envs
