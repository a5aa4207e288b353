#!/bin/bash
# Re-runs every DCP interop experiment (CPU only, ~3 min on 2 cores). Outputs under /tmp/dcp-research/run.
# torch 2.15.0 (PyPI, /opt/volt/python-torchrun) + safetensors 0.8.0 (/opt/volt/python-safetensors).
set -e
S=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH=$S:/opt/volt/python-torchrun:/opt/volt/python-safetensors OMP_NUM_THREADS=1
PY="nice -n 19 /usr/bin/python3 -W ignore"
R=/tmp/dcp-research/run; rm -rf $R; mkdir -p $R; cd $R
f() { grep -v "NumPy\|cpu = _conv\|^  OK" || true; }
echo "== HF safetensors layout written with raw bytes (Volt -> PyTorch)"
$PY $S/exp1_hf_write.py hf2 2 | f; $PY $S/exp1_hf_write.py hf4 4 | f
for d in hf2 hf4; do $PY $S/exp2_hf_load_single.py $d 2>&1 | grep "^\[\|ALL\|MISM\|BAD\|fails\|without\|with Def"; done
for d in hf2 hf4; do for W in 1 2 4; do $PY $S/exp3_hf_load_fsdp.py $d $W 2>&1 | grep -o "W=.\] rank .: [A-Z ]*" ; done; done
$PY $S/exp8_hf_edge.py 2>&1 | grep "^\[\|^  "
echo "== DCP native layout (.metadata via fixed pickle writer + torch.save items) (Volt -> PyTorch)"
$PY $S/exp5_distcp_write.py fs2t 2 torchsave | f; $PY $S/exp5_distcp_write.py fs4l 4 libtorch | f
for d in fs2t fs4l; do $PY $S/exp6_fs_load_single.py $d reference.pt 2>&1 | grep "^\[\|ALL\|MISM\|BAD\|keys"; done
for d in fs2t fs4l; do for W in 1 2 4; do $PY $S/exp3_hf_load_fsdp.py $d $W 2>&1 | grep -o "W=.\] rank .: [A-Z ]*"; done; done
echo "== PyTorch FSDP2 dcp.save -> minimal reader (PyTorch -> Volt)"
$PY $S/exp4_dcp_save.py $R/dcp_ws2 2 | f; $PY $S/exp4_dcp_save.py $R/dcp_ws4 4 | f
$PY $S/exp4b_inspect.py dcp_ws2 2>&1 | f | head -8
for W in 2 4; do $PY $S/exp7_read_dcp_minimal.py dcp_ws$W dcp_ws$W.reference.pt 2>&1 | grep "ALL\|MISM\|BAD"; done
$PY $S/exp4_dcp_save.py $R/hfpt2 2 hf | f; find hfpt2 -type f | sort
