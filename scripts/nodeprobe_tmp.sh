set -x
export PYTHONPATH=/tmp/site:/tmp/sitk:$PWD MEDPROC_OFFLINE=1
env | grep -i "^PYTHON"
python -c "import sys; print(sys.version, sys.flags.dont_write_bytecode)"
nproc; cat /proc/cpuinfo | grep "model name" | head -1; cat /sys/kernel/mm/transparent_hugepage/enabled
for i in 1 2; do /usr/bin/time -f "import medproc.cli %e" python -c "import medproc.cli"; done
python -m compileall -q -j 16 /tmp/site /tmp/sitk "$(python -c "import numpy, os; print(os.path.dirname(numpy.__file__))")" medproc > /dev/null 2>&1
for i in 1 2 3; do /usr/bin/time -f "import medproc.cli after compileall %e" python -c "import medproc.cli"; done
/usr/bin/time -f "python -c pass %e" python -c pass
/usr/bin/time -f "python -S -c pass %e" python -S -c pass
python -X importtime -c "import medproc.cli" 2>&1 | sort -t'|' -k2 -n | tail -30
python -X importtime -c "import medproc.cli" 2>&1 | sort -t'|' -k1.13 -n | tail -25
python - <<'PY'
import time, numpy as np, os
from nvidia.dali import fn, pipeline_def, types
@pipeline_def(batch_size=1, num_threads=1, device_id=None, exec_dynamic=True, prefetch_queue_depth=1)
def pipe():
    x = fn.external_source(name="img", layout="DHWC")
    return fn.resize(x, size=[119,239,239], interp_type=types.INTERP_LINEAR, antialias=False, dtype=types.FLOAT)
p = pipe(); p.build()
a = (np.random.rand(143,512,512,1)*1000).astype(np.int16)
for i in range(4):
    t=time.perf_counter(); p.feed_input("img",[a]); o,=p.run(); arr=o.as_array(); print("dali resize", i, f"{time.perf_counter()-t:.3f}")
from isal import isal_zlib
b = arr.tobytes()
t=time.perf_counter(); isal_zlib.compress(b, 1); print("isal 1", f"{time.perf_counter()-t:.3f}")
PY
