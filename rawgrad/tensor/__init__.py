"""The Tensor front end: Tensor API, scheduler and realize loop."""
