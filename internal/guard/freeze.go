package guard

import "fmt"

// Texts of a panic whose value's methods called runtime.Goexit while
// [Freezer.FreezeAside] asked them for their text.
const (
	goexitText      = "tinymq: panic (its value's methods called runtime.Goexit)"
	goexitValueText = "(a value whose methods called runtime.Goexit)"
)

// A Freezer freezes the errors of one package's consumers. Its fields name
// what of that package it deals in (its sentinels, and its panic error type
// P, such as *tinymq.PanicError), which this package cannot import; set them
// all. Its methods are safe for concurrent use.
type Freezer[P error] struct {
	// TypedNil is wrapped by what a typed nil error becomes.
	TypedNil error
	// Permanent is matched by a frozen error when the original matched it.
	Permanent error
	// Panicked is matched by every P: Freeze looks for a P only in the
	// errors that match it.
	Panicked error
	// Unpack returns a P's panic value and stack. It is called on a non-nil
	// P only, and must not run user code.
	Unpack func(p P) (value any, stack []byte)
	// Pack returns a P holding text as its value, with stack. It must not
	// run user code.
	Pack func(text string, stack []byte) P
}

// Freeze returns what an engine keeps of a consumer's error, asking its
// methods once, here: nil stays nil; a typed nil becomes an error wrapping
// TypedNil that names its type; any other error becomes one whose Error is
// err's text ([ErrorText]), which matches Permanent when err did, and which
// unwraps, when err holds a P, to a copy of that P whose value is its text
// ([ValueText]). None of the frozen error's methods runs the consumer's code,
// so settling, logging and dead-lettering it never do.
//
// Freeze recovers the panics of err's methods, not a runtime.Goexit: call it
// where the consumer's own Goexit is caught (in the consumer's guarded
// call), or through [Freezer.FreezeAside].
func (f *Freezer[P]) Freeze(err error) error {
	if err == nil {
		return nil
	}
	if IsNil(err) {
		return fmt.Errorf("%w: the consumer returned a nil %T", f.TypedNil, err)
	}
	fe := &frozenError{text: ErrorText(err)}
	if Is(err, f.Permanent) {
		fe.permanent = f.Permanent
	}
	if !Is(err, f.Panicked) { // cheaper than As, and the common case
		return fe
	}
	if p, ok := As[P](err); ok && !IsNil(p) { // keep its text, not the consumer's value
		value, stack := f.Unpack(p)
		fe.panic = f.Pack(ValueText(value), stack)
	}
	return fe
}

// FreezeAside is Freeze for p, the error a recovered panic became, run
// through o.Guard: the value's methods are the consumer's code, and the
// worker's recover is spent once it recovered the panic, so a
// runtime.Goexit in them must end another goroutine than the worker; and
// counted in o, so that a Stop they call does not wait for the worker that
// waits for them. If they call runtime.Goexit (or panic out of every
// recover), the frozen error says so, keeping p's stack.
func (f *Freezer[P]) FreezeAside(o *Owned, p P) error {
	_, stack := f.Unpack(p)
	frozen := error(&frozenError{text: goexitText, panic: f.Pack(goexitValueText, stack)})
	o.Guard(func() { frozen = f.Freeze(p) }) // Freeze recovers its own calls; Guard is a last one
	return frozen
}

// frozenError is a consumer's error as an engine keeps it (see
// [Freezer.Freeze]): none of its methods reach the consumer's code.
type frozenError struct {
	text      string
	permanent error // the Freezer's Permanent, if the original matched it
	panic     error // a copy of the P it wrapped, if any, with the value's text as value
}

func (e *frozenError) Error() string { return e.text }

func (e *frozenError) Is(target error) bool { return e.permanent != nil && target == e.permanent }

func (e *frozenError) Unwrap() error { return e.panic }
