"""Training: the loop (train_and_evaluate), pure steps, compilation, evaluation, pre-flight,
optimiser, dropout generators and the device mesh."""
