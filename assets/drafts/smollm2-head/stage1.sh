cd /work/main
exec .venv/bin/python scripts/train_head.py train --features .dev/head/features/onpolicy \
  --eval-features .dev/head/features/heldout --eval-data assets/evalsets/smollm2-heldout.npz \
  --out .dev/head/s1/out --ckpt-dir .dev/head/s1/ckpt --taps=-1 \
  --vocab-size 12288 --vocab-from assets/drafts/smollm2-draft/data.npz assets/drafts/smollm2-head/corpus.npz \
  --depths 3 --eval-depths 4 --deep-fraction 0.5 --reg-weight 1 --kl-weight 0.3 --overlap-weight 0.3 \
  --feature-rms 2.0 --lr 2e-3 --epochs 1.4 --export-every-s 1200 --time-budget 3000 --threads 1
