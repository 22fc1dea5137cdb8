r() { echo "== $*"; env "$@" cnninfer run $F .device/model.hdf5 --json -q ${RD:+--readers $RD} 2>/tmp/err >/tmp/out; cat /tmp/err; python3 -c "
import json
d=json.load(open('/tmp/out')); t=d['timing_ms']; print(f\"forward {t['forward']:.0f} ms = {d['n']/t['forward']/1e3:.2f}M/s read {t['read']:.0f} wait {t['wait']:.0f} correct {d['correct']} {d['reader']['threads']}\")"; }
python3 tools/make_big.py $CNNINFER_DATA /tmp big big_u8 >/dev/null
F=/tmp/big.hdf5
for rd in 6 8 12 16; do RD=$rd r A=1; RD=$rd r A=1; done
RD=8 r CNNINFER_STREAM_IMAGES=4096; RD=8 r CNNINFER_STREAM_IMAGES=4096
RD=8 r CNNINFER_STREAM_IMAGES=16384
python3 - <<'PY'
import os, time
os.environ["CNNINFER_HOST_BUDGET_MB"] = "0"
from infer.session import Session
for readers in (8, 16):
    with Session(".device/model.hdf5", backend="cuda", readers=readers) as s:
        for i in range(4):
            r = s.evaluate("/tmp/big.hdf5")
            print(f"in one process, {readers} readers, run {i}: forward {r.timing['forward']:.0f} ms = {r.n / r.timing['forward'] / 1e3:.2f}M/s, wait {r.timing['wait']:.0f}")
PY
