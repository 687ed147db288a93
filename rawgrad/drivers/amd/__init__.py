"""AMD GPUs (gfx1100 / RDNA3 first): driver pieces; under mock/ the CI stand-ins that need no hardware."""
