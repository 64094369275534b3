module github.com/tinymq/tinymq/amqp

go 1.26.0

require (
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/stretchr/testify v1.11.1
	github.com/tinymq/tinymq v0.0.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/davecgh/go-spew v1.1.1 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)

replace github.com/tinymq/tinymq => ../
