r() { echo "== $*"; env "$@" cnninfer run $F .device/model.hdf5 --json -q 2>/tmp/err >/tmp/out; cat /tmp/err; python3 -c "
import json
d=json.load(open('/tmp/out')); t=d['timing_ms']; print(f\"forward {t['forward']:.0f} ms = {d['n']/t['forward']/1e3:.2f}M/s read {t['read']:.0f} wait {t['wait']:.0f} correct {d['correct']} {d['reader']}\")"; }
python3 tools/make_big.py $CNNINFER_DATA /tmp big big_u8 >/dev/null
F=/tmp/big.hdf5
r A=1; r A=1; r CNNINFER_STREAM_IMAGES=16384; r CNNINFER_STREAM_IMAGES=4096
F=/tmp/big_u8.hdf5
r A=1; r A=1; r CNNINFER_NATIVE=0
