package guard

import (
	"errors"
	"fmt"
	"reflect"
)

// IsNil reports whether err is a non-nil interface holding a nil pointer (or
// map, slice, func, chan, interface): a typed nil, whose methods may panic.
// It runs none of err's methods.
func IsNil(err error) bool {
	v := reflect.ValueOf(err)
	switch v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return v.IsNil()
	}
	return false
}

// ErrorText returns err.Error(), or, if that panics, a description naming
// err's type and the type of what it panicked with (never formatting that
// value: its own methods could panic again). ErrorText(nil) is "". It runs
// err's Error method on the calling goroutine: a runtime.Goexit there ends
// the caller (run it under [Owned.Guard], or on a frozen error).
func ErrorText(err error) (s string) {
	if err == nil {
		return ""
	}
	defer func() {
		if r := recover(); r != nil {
			s = fmt.Sprintf("%T (its Error method panicked with a %T)", err, r)
		}
	}()
	return err.Error()
}

// ValueText is fmt.Sprint(v), or, if v's methods panic out of fmt, a
// description naming v's type and the type of what they panicked with. It
// runs v's methods on the calling goroutine, as [ErrorText] does.
func ValueText(v any) (s string) {
	defer func() {
		if r := recover(); r != nil {
			s = fmt.Sprintf("%T (its methods panicked with a %T)", v, r)
		}
	}()
	return fmt.Sprint(v)
}

// Is is errors.Is(err, target) for an error whose Is and Unwrap methods are
// user code: a panic in them counts as no match.
func Is(err, target error) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return errors.Is(err, target)
}

// As is errors.As for an error whose As and Unwrap methods are user code: it
// returns the first error of type E in err's chain, and whether there was
// one; a panic in those methods counts as none. The E it returns may be a
// typed nil, if the chain holds one.
func As[E error](err error) (e E, ok bool) {
	defer func() {
		if recover() != nil {
			var zero E
			e, ok = zero, false
		}
	}()
	ok = errors.As(err, &e)
	return e, ok
}
