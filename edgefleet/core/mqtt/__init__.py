"""One MQTT connection for host and device alike: reaching a broker, subscriptions that wait for their SUBACK."""
