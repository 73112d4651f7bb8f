"""Long Range Arena for nanoToST: data (data.py, generate.py), the encoder
classifier (encoder.py) and one training script (train.py). See lra/README.md."""
