// Command devices shows RabbitMQ-style routing: every device has its own queue,
// bound to a fanout exchange for broadcasts and to a topic exchange for
// messages addressed to it ("device.<id>") or to its group ("group.<name>.*"
// style patterns).
//
//	go run ./examples/devices
package main

import (
	"context"
	"fmt"
	"log"
	"sort"
	"strings"
	"sync"

	"github.com/tinymq/tinymq"
)

type device struct {
	id    string
	group string
}

func main() {
	mq := tinymq.New()
	var mu sync.Mutex
	inbox := map[string][]string{}

	devices := []device{{"d1", "kitchen"}, {"d2", "kitchen"}, {"d3", "garage"}}
	for _, d := range devices {
		consume := func(ctx context.Context, msg *tinymq.Msg) error {
			mu.Lock()
			defer mu.Unlock()
			inbox[d.id] = append(inbox[d.id], fmt.Sprintf("%s via %s", msg.Data, msg.Exchange))
			return nil
		}
		// The queue is created bound to the broadcast exchange ...
		if err := mq.RegisterQueue("broadcast", tinymq.Fanout, consume, 1, tinymq.WithQueueName("dev-"+d.id)); err != nil {
			log.Fatal(err)
		}
		// ... and bound again to the topic exchange, for its own key and its group.
		err := mq.Bind("dev-"+d.id, "devices", tinymq.Topic,
			tinymq.WithBindingKey("device."+d.id),
			tinymq.WithBindingKey("group."+d.group+".*"))
		if err != nil {
			log.Fatal(err)
		}
	}
	if err := mq.Start(context.Background()); err != nil {
		log.Fatal(err)
	}

	publish := func(exchange, key, text string) {
		if err := mq.Publish(exchange, text, tinymq.WithRoutingKey(key)); err != nil {
			fmt.Printf("publish %q to %s/%s: %v\n", text, exchange, key, err)
		}
	}
	publish("broadcast", "", "firmware 2.1 available")
	publish("devices", "device.d3", "open the door")
	publish("devices", "group.kitchen.lights", "lights off")
	publish("devices", "device.d9", "nobody is d9") // ErrNoRoute: reported, not lost

	mq.Stop()
	ids := make([]string, 0, len(inbox))
	for id := range inbox {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		fmt.Printf("%s: %s\n", id, strings.Join(inbox[id], "; "))
	}
}
