cd /work/main
exec .venv/bin/python scripts/train_head.py train --features .dev/head/features/onpolicy .dev/head/features/corpus \
  --eval-features .dev/head/features/heldout --eval-data assets/evalsets/smollm2-heldout.npz \
  --out .dev/head/s2/out --ckpt-dir .dev/head/s2/ckpt --taps=-1 --init-from .dev/head/s1/out \
  --vocab-size 12288 --vocab-from assets/drafts/smollm2-draft/data.npz assets/drafts/smollm2-head/corpus.npz \
  --depths 3 --eval-depths 4 --deep-fraction 0.5 --reg-weight 1 --kl-weight 0.3 --overlap-weight 0.3 \
  --feature-rms 2.0 --lr 1e-3 --warmup-steps 5 --epochs 0.8 --export-every-s 3600 --time-budget 2400 --threads 1
