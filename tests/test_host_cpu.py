"""The host CPU fingerprint that keys machine-code caches (the cpu kernel's library, XLA:CPU executables)."""

from ember.compiler.kernels.cpu_gemv import native
from ember.compiler.targets import host_cpu
from ember.runtime.loading import model as model_loading

AVX2_HOST = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 49
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma

processor\t: 1
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx avx2 fma avx512f
"""


def test_hosts_with_other_instruction_sets_differ():
    avx512 = AVX2_HOST.replace("avx2 fma\n\nprocessor", "avx2 fma avx512f avx512_vnni\n\nprocessor", 1)
    assert host_cpu.describe(AVX2_HOST) != host_cpu.describe(avx512)
    assert host_cpu.describe(AVX2_HOST) != host_cpu.describe(AVX2_HOST.replace("model\t\t: 49", "model\t\t: 17"))
    # the first processor decides; the flags' order does not
    assert host_cpu.describe(AVX2_HOST) == host_cpu.describe(AVX2_HOST.replace("avx avx2 fma", "fma avx2 avx"))
    assert "avx512f" not in host_cpu.describe(AVX2_HOST)


def test_no_cpuinfo_falls_back_to_the_platform():
    assert host_cpu.describe(None) == host_cpu.describe("")
    assert host_cpu.describe(None)


def test_caches_are_keyed_by_the_host(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    here = native.library_path()
    monkeypatch.setattr(host_cpu, "fingerprint", lambda: "another-cpu")
    assert native.library_path() != here
    assert native.library_path().parent == here.parent


def test_jax_cache_folder_is_per_host(monkeypatch, tmp_path):
    import jax

    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        model_loading.enable_compilation_cache()
        folder = jax.config.jax_compilation_cache_dir
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
    assert folder == str(tmp_path / "jax-cache" / f"host-{host_cpu.fingerprint()}")
