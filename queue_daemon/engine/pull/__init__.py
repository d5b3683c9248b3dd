"""Jobs of pulled types: claims by the tenants' own workers, completions, held waits."""
