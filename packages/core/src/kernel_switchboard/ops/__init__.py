"""Public op functions, one module per op family."""
