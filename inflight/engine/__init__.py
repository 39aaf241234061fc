"""The engine: request intake, the step loop, output processing."""
