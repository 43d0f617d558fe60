"""The broker itself: the embedded amqtt broker, reading what a broker retains, and clearing what should not stay."""
