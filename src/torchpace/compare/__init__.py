"""`torchpace compare`: is config B faster than config A? Both measured in alternation (`torchpace.trial.pair`)."""
