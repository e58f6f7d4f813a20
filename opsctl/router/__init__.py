"""sglang-router in front of services: render its release (render), deploy it like a service (deploy), speak to
its control API (api), and take workers out and back in around a service deploy (rolling)."""
