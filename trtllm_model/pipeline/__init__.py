"""The request pipeline below the executors: request checks and build limits, text encoding and detokenizing."""
