"""Hardware profiles as data: one YAML file per profile, validated by edgefleet.core.profiles."""
