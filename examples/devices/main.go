// Command devices tells the story of devices that come and go. Each device
// declares its own queue at run time (MQ.DeclareQueue), bound to a fanout
// exchange for broadcasts and to a topic exchange for its own messages
// (devices.<id>.#). Online, it consumes the queue (MQ.Consume); offline
// (Subscription.Cancel), its messages wait there, and it gets them when it
// comes back. A device that never returns has its queue expire
// (WithQueueExpiry), messages and all.
//
// With a data directory the queues are durable, and the story restarts the
// MQ while a device is offline: its backlog is still there afterwards.
//
//	go run ./examples/devices
//	go run ./examples/devices -data "$(mktemp -d)"   # or TINYMQ_DATA=DIR
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/tinymq/tinymq"
)

// expiry is how long a device's queue outlives its device: short, so that
// the story ends in seconds.
const expiry = 2 * time.Second

var devices = []string{"lamp", "thermostat", "sensor"}

// fleet is the devices' side of one MQ: the queues' options, and what the
// devices received.
type fleet struct {
	mq     *tinymq.MQ
	queue  []tinymq.QueueOption
	online map[string]*tinymq.Subscription
	inbox  chan received
}

// received is a message a device got.
type received struct{ device, text string }

func main() {
	dir := flag.String("data", os.Getenv("TINYMQ_DATA"), "data directory: durable queues, and a restart half way")
	flag.Parse()
	if err := run(*dir); err != nil {
		log.Fatal(err)
	}
}

func run(dir string) error {
	f := &fleet{inbox: make(chan received, 16),
		queue: []tinymq.QueueOption{tinymq.WithMessageTTL(time.Hour), tinymq.WithQueueExpiry(expiry)}}
	// TinyMQ logs to this what it removes, and what Stop leaves in the log.
	opts := []tinymq.Option{tinymq.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil)))}
	if dir != "" {
		f.queue = append(f.queue, tinymq.WithDurable())
		opts = append(opts, tinymq.WithDataDir(dir))
	}
	if err := f.start(opts, devices...); err != nil {
		return err
	}
	fmt.Println("online:", devices)
	if err := f.publish("broadcast", "", "firmware 2.1 available"); err != nil {
		return err
	}
	f.await(3)

	fmt.Println("thermostat and sensor go offline")
	f.offline("thermostat")
	f.offline("sensor")
	if err := f.publish("devices", "devices.thermostat.set", "set 21°C"); err != nil {
		return err
	}
	if err := f.publish("devices", "devices.sensor.calibrate", "calibrate"); err != nil {
		return err
	}
	if err := f.publish("broadcast", "", "maintenance at 02:00"); err != nil {
		return err
	}
	f.await(1)
	f.depths()

	if dir != "" {
		fmt.Println("restart: stop the MQ, start a new one on", dir)
		f.mq.Stop() // the offline devices' messages stay in the log
		if err := f.start(opts, "lamp"); err != nil {
			return err
		}
		f.depths()
	} else {
		fmt.Println("(with -data DIR the MQ restarts here, and the backlog survives)")
	}

	fmt.Println("thermostat is back online")
	if err := f.connect("thermostat"); err != nil {
		return err
	}
	f.await(2)

	fmt.Println("sensor never comes back")
	for deadline := time.Now().Add(5 * expiry); f.mq.Stats().ExpiredQueues == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("dev-sensor did not expire within %v", 5*expiry)
		}
	}
	s := f.mq.Stats()
	fmt.Printf("  dev-sensor expired, unused for %v: %d messages removed; queues left: %v\n",
		expiry, s.Deleted.Removed, slices.Sorted(maps.Keys(s.Queues)))
	f.mq.Stop()
	return nil
}

// start starts an MQ, declares every device's queue (which a durable one
// finds again in the log after a restart) and connects the given devices.
func (f *fleet) start(opts []tinymq.Option, connect ...string) error {
	f.mq = tinymq.New(opts...)
	f.online = make(map[string]*tinymq.Subscription)
	for _, id := range devices {
		queue := "dev-" + id
		if err := f.mq.DeclareQueue(queue, "broadcast", tinymq.Fanout, f.queue...); err != nil {
			return err
		}
		// The same queue again, with the same settings: one more binding.
		bind := append(slices.Clone(f.queue), tinymq.WithBindingKey("devices."+id+".#"))
		if err := f.mq.DeclareQueue(queue, "devices", tinymq.Topic, bind...); err != nil {
			return err
		}
	}
	if err := f.mq.Start(context.Background()); err != nil {
		return err
	}
	for _, id := range connect {
		if err := f.connect(id); err != nil {
			return err
		}
	}
	return nil
}

// connect is a device coming online: it consumes its queue.
func (f *fleet) connect(id string) error {
	sub, err := tinymq.ConsumeHandler(f.mq, "dev-"+id, func(_ context.Context, text string) error {
		f.inbox <- received{id, text}
		return nil
	}, 1)
	f.online[id] = sub
	return err
}

// offline is a device going away: its subscription ends, its queue stays.
func (f *fleet) offline(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := f.online[id].Cancel(ctx); err != nil {
		log.Printf("%s: %v", id, err)
	}
	delete(f.online, id)
}

func (f *fleet) publish(exchange, key, text string) error {
	fmt.Printf("publish %q to %s\n", text, strings.TrimSuffix(exchange+" with key "+key, " with key "))
	return f.mq.Publish(exchange, text, tinymq.WithRoutingKey(key))
}

// await prints the next n messages the devices received, by device (they run
// concurrently), each device's in the order it got them.
func (f *fleet) await(n int) {
	got := make([]received, 0, n)
	for range n {
		select {
		case r := <-f.inbox:
			got = append(got, r)
		case <-time.After(5 * time.Second):
			got = append(got, received{"?", "(a message did not arrive)"})
		}
	}
	slices.SortStableFunc(got, func(a, b received) int { return strings.Compare(a.device, b.device) })
	for _, r := range got {
		fmt.Printf("  %s got %q\n", r.device, r.text)
	}
}

// depths prints what waits in the offline devices' queues.
func (f *fleet) depths() {
	s := f.mq.Stats()
	fmt.Printf("  waiting: dev-thermostat %d, dev-sensor %d\n", s.Queues["dev-thermostat"].Depth, s.Queues["dev-sensor"].Depth)
}
