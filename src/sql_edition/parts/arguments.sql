-- ---------------------------------------------------------------- settings and arguments
--
-- The settings are the C++ edition's names (idempotency.default_lease, ...).
-- Without the library PostgreSQL keeps them as plain strings (placeholder
-- settings): a number means the C++ edition's unit (milliseconds or
-- seconds), anything else is read as an interval ('5s', '2 min').

CREATE FUNCTION idempotency.raise_setting_value(name pg_catalog.text, value pg_catalog.text,
                                                hint pg_catalog.text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF hint IS NULL THEN
        RAISE EXCEPTION 'invalid value for parameter "idempotency.%": "%"', name, value
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RAISE EXCEPTION 'invalid value for parameter "idempotency.%": "%"', name, value
        USING ERRCODE = 'invalid_parameter_value', HINT = hint;
END
$$;

-- Refuses `units`, the setting `name` (written `value`) in its unit, when
-- outside the C++ edition's range for it; returns it rounded, as the C++
-- edition rounds a value with units. The messages are PostgreSQL's for the
-- C++ edition's settings: beyond a 32-bit integer, an invalid value; else
-- outside the range (from PostgreSQL 16 on, each bound with its unit).
-- The ranges are plain expressions, no query: this runs in each call that
-- reads a setting that is set.
CREATE FUNCTION idempotency.setting_in_range(name pg_catalog.text, value pg_catalog.text,
                                             units pg_catalog.numeric)
RETURNS pg_catalog.numeric
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    rounded numeric := round(units);
    lowest int8 := CASE WHEN name IN ('retention', 'key_retention', 'outbox_retention',
                                      'inbox_retention', 'retry_base_delay', 'retry_max_delay')
                        THEN 0 ELSE 1 END;
    highest int8 := CASE WHEN name IN ('outbox_run_length', 'max_steps') THEN 10000
                         WHEN name = 'purge_batch' THEN 1000000
                         WHEN name IN ('max_value_bytes', 'max_step_bytes') THEN 1073741823
                         ELSE 2147483647 END;
    unit text;
    bound_unit text;
BEGIN
    IF rounded < -2147483648 OR rounded > 2147483647 THEN
        PERFORM idempotency.raise_setting_value(name, value, 'Value exceeds integer range.');
    ELSIF rounded < lowest OR rounded > highest THEN
        unit := CASE WHEN name IN ('default_lease', 'max_lease', 'stuck_after', 'retry_base_delay',
                                   'retry_max_delay') THEN ' ms'
                     WHEN name LIKE '%retention' THEN ' s'
                     WHEN name LIKE '%bytes' THEN ' B'
                     ELSE '' END;
        bound_unit := CASE WHEN current_setting('server_version_num')::int4 >= 160000 THEN unit
                           ELSE '' END;
        RAISE EXCEPTION '% is outside the valid range for parameter "idempotency.%" (% .. %)',
                        rounded || unit, name, lowest || bound_unit, highest || bound_unit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN rounded;
END
$$;

-- A setting's value as PostgreSQL reads the C++ edition's integer settings
-- (parse_int), in whole units of `base` ('ms', 's', 'B'; NULL: a setting
-- that takes no unit): a number (decimal; with a leading 0 octal, with 0x
-- hexadecimal, as strtol reads them; a fraction or an exponent as strtod),
-- then one of the units of its kind (time: us, ms, s, min, h, d; memory:
-- B, kB, MB, GB, TB), rounded half to even. Refused with PostgreSQL's
-- message and hint otherwise, or past a 32-bit integer; but a time setting
-- also takes an interval ('2 days').
CREATE FUNCTION idempotency.setting_units(name pg_catalog.text, value pg_catalog.text,
                                          base pg_catalog.text)
RETURNS pg_catalog.numeric
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    parts text[];
    number numeric;
    rest text;
    digit text;
BEGIN
    parts := regexp_match(value, '^\s*([+-]?)0[xX]([0-9a-fA-F]+)(.*)$');
    IF parts IS NOT NULL THEN
        number := 0;
        FOREACH digit IN ARRAY regexp_split_to_array(lower(parts[2]), '') LOOP
            number := number * 16 + position(digit IN '0123456789abcdef') - 1;
        END LOOP;
    ELSE
        parts := regexp_match(value, '^\s*([+-]?)([0-9]*)(.*)$');
        IF parts[3] ~ '^[.eE]' THEN
            parts := regexp_match(value, '^\s*([+-]?)([0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)(.*)$');
            IF parts IS NULL THEN
                PERFORM idempotency.raise_setting_value(name, value);
            END IF;
            number := parts[2]::numeric;
        ELSIF parts[2] = '' THEN
            PERFORM idempotency.raise_setting_value(name, value);
        ELSIF parts[2] ~ '^0' THEN
            -- octal: the digits up to the first 8 or 9, which start the rest
            parts := regexp_match(value, '^\s*([+-]?)(0[0-7]*)(.*)$');
            number := 0;
            FOREACH digit IN ARRAY regexp_split_to_array(parts[2], '') LOOP
                number := number * 8 + digit::int4;
            END LOOP;
        ELSE
            number := parts[2]::numeric;
        END IF;
    END IF;
    IF parts[1] = '-' THEN
        number := -number;
    END IF;
    rest := btrim(parts[3], E' \t\n\r\f\v');
    IF rest = '' THEN
        NULL;
    ELSIF base IS NULL THEN
        PERFORM idempotency.raise_setting_value(name, value);
    ELSIF base = 'B' THEN
        IF rest NOT IN ('B', 'kB', 'MB', 'GB', 'TB') THEN
            PERFORM idempotency.raise_setting_value(name, value,
                'Valid units for this parameter are "B", "kB", "MB", "GB", and "TB".');
        END IF;
        number := number * CASE rest WHEN 'kB' THEN 1024 WHEN 'MB' THEN 1048576
                                     WHEN 'GB' THEN 1073741824 WHEN 'TB' THEN 1099511627776 ELSE 1 END;
    ELSIF rest IN ('us', 'ms', 's', 'min', 'h', 'd') THEN
        number := number * CASE rest WHEN 'us' THEN 1 WHEN 'ms' THEN 1000 WHEN 's' THEN 1000000
                                     WHEN 'min' THEN 60000000 WHEN 'h' THEN 3600000000 ELSE 86400000000 END
                  / CASE base WHEN 'ms' THEN 1000 ELSE 1000000 END;
    ELSE
        -- The SQL edition reads an interval too ('2 days'), which the C++
        -- edition refuses.
        BEGIN
            number := idempotency.micros(value::interval) / CASE base WHEN 'ms' THEN 1000 ELSE 1000000 END;
        EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
            PERFORM idempotency.raise_setting_value(name, value,
                'Valid units for this parameter are "us", "ms", "s", "min", "h", and "d".');
        END;
    END IF;
    -- rint: half to even
    number := CASE WHEN abs(number - trunc(number)) = 0.5 THEN 2 * round(number / 2) ELSE round(number) END;
    IF number IS NULL OR number < -2147483648 OR number > 2147483647 THEN
        PERFORM idempotency.raise_setting_value(name, value, 'Value exceeds integer range.');
    END IF;
    RETURN number;
END
$$;

-- The setting `name` as an interval; `unit` is what its number counts (a
-- bare number, and the value the others are rounded to).
-- In the C++ edition's form, hours and seconds only ('24:00:00', not
-- '1 day'): a setting is a number of its unit there, and a row that keeps
-- it (a key's retention) holds the same value in both editions.
CREATE FUNCTION idempotency.setting_interval(name pg_catalog.text, unit pg_catalog.interval,
                                             fallback pg_catalog.interval)
RETURNS pg_catalog.interval
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    value text := current_setting('idempotency.' || name, true);
    total numeric;
BEGIN
    IF value IS NULL OR value = '' THEN
        total := idempotency.micros(fallback);
    ELSE
        total := idempotency.setting_in_range(name, value, idempotency.setting_units(
                     name, value, CASE WHEN unit = interval '1 ms' THEN 'ms' ELSE 's' END))
                 * idempotency.micros(unit);
    END IF;
    RETURN make_interval(hours => trunc(total / 3600000000)::int4,
                         secs => (total - trunc(total / 3600000000) * 3600000000) / 1000000);
END
$$;

-- A setting's value, set and not empty, as a whole number in its range.
CREATE FUNCTION idempotency.setting_int_value(name pg_catalog.text, value pg_catalog.text)
RETURNS pg_catalog.int4
LANGUAGE plpgsql STABLE STRICT
AS $$
BEGIN
    RETURN idempotency.setting_in_range(name, value, idempotency.setting_units(name, value, NULL));
END
$$;

-- The setting `name` as a whole number (checked only when set: the
-- fallback costs one current_setting).
CREATE FUNCTION idempotency.setting_int(name pg_catalog.text, fallback pg_catalog.int4)
RETURNS pg_catalog.int4
LANGUAGE sql STABLE
AS $$
SELECT COALESCE(idempotency.setting_int_value(name, NULLIF(current_setting('idempotency.' || name, true), '')),
                fallback)
$$;

-- The setting `name` as a number of bytes ('1kB', '2MB' or a bare number).
CREATE FUNCTION idempotency.setting_bytes(name pg_catalog.text, fallback pg_catalog.int8)
RETURNS pg_catalog.int8
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    value text := current_setting('idempotency.' || name, true);
BEGIN
    IF value IS NULL OR value = '' THEN
        RETURN fallback;
    END IF;
    RETURN idempotency.setting_in_range(name, value, idempotency.setting_units(name, value, 'B'));
END
$$;

-- A setting's value, set and not empty, as a boolean (the spellings
-- PostgreSQL takes for one).
CREATE FUNCTION idempotency.setting_bool_value(name pg_catalog.text, value pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE plpgsql STABLE STRICT
AS $$
BEGIN
    IF lower(value) !~ '^(t|tr|tru|true|y|ye|yes|on|1|f|fa|fal|fals|false|n|no|of|off|0)$' THEN
        RAISE EXCEPTION 'parameter "idempotency.%" requires a Boolean value', name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN value::bool;
END
$$;

-- The setting `name` as a boolean.
CREATE FUNCTION idempotency.setting_bool(name pg_catalog.text, fallback pg_catalog.bool)
RETURNS pg_catalog.bool
LANGUAGE sql STABLE
AS $$
SELECT COALESCE(idempotency.setting_bool_value(name, NULLIF(current_setting('idempotency.' || name, true), '')),
                fallback)
$$;

-- An interval in microseconds as the C++ edition counts it (a month is 30
-- days, a day 24 hours); NULL when it does not fit in 64 bits.
CREATE FUNCTION idempotency.micros(value pg_catalog.interval)
RETURNS pg_catalog.numeric
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    months numeric := extract(year FROM value) * 12 + extract(month FROM value);
    days numeric := extract(day FROM value);
    total numeric;
BEGIN
    total := (months * 30 + days) * 86400000000
             + extract(epoch FROM value - make_interval(months => months::int4, days => days::int4))
               * 1000000;
    RETURN CASE WHEN abs(total) <= 9223372036854775807 THEN total END;
END
$$;

-- A duration as the C++ edition writes it in messages: "1 day", "30 s",
-- "250 ms", else in microseconds.
CREATE FUNCTION idempotency.format_duration(value pg_catalog.numeric)
RETURNS pg_catalog.text
LANGUAGE sql IMMUTABLE
AS $$
SELECT COALESCE(
    (SELECT (value / u.size)::int8 || ' ' || CASE WHEN value = u.size THEN u.one ELSE u.many END
       FROM (VALUES (1, 86400000000::numeric, 'day', 'days'), (2, 3600000000, 'hour', 'hours'),
                    (3, 60000000, 'min', 'min'), (4, 1000000, 's', 's'), (5, 1000, 'ms', 'ms'))
            AS u (n, size, one, many)
      WHERE value >= u.size AND value % u.size = 0
      ORDER BY u.n LIMIT 1),
    value::int8 || ' us')
$$;

CREATE FUNCTION idempotency.raise_null(name pg_catalog.text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION '% must not be null', name USING ERRCODE = 'null_value_not_allowed';
END
$$;

-- A required name: not NULL, not empty, at most max_bytes bytes.
CREATE FUNCTION idempotency.check_name(value pg_catalog.text, name pg_catalog.text,
                                       max_bytes pg_catalog.int4 DEFAULT 255)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '% must not be null', name USING ERRCODE = 'null_value_not_allowed';
    ELSIF value = '' THEN
        RAISE EXCEPTION '% must not be empty', name USING ERRCODE = 'invalid_parameter_value';
    ELSIF octet_length(value) > max_bytes THEN
        RAISE EXCEPTION '% must be at most % bytes long (it has %)', name, max_bytes, octet_length(value)
            USING ERRCODE = 'string_data_right_truncation';
    END IF;
END
$$;

-- An optional name (job_ref, a lock's owner): at most 255 bytes.
CREATE FUNCTION idempotency.check_optional_name(value pg_catalog.text, name pg_catalog.text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF octet_length(value) > 255 THEN
        RAISE EXCEPTION '% must be at most 255 bytes long (it has %)', name, octet_length(value)
            USING ERRCODE = 'string_data_right_truncation';
    END IF;
END
$$;

-- A value (result, request, payload, error) of `bytes` bytes against
-- idempotency.max_value_bytes.
CREATE FUNCTION idempotency.check_value_size(bytes pg_catalog.int8, name pg_catalog.text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    max_bytes int8 := idempotency.setting_bytes('max_value_bytes', 1048576);
BEGIN
    IF bytes > max_bytes THEN
        RAISE EXCEPTION '% must be at most % bytes (idempotency.max_value_bytes); it has %',
                        name, max_bytes, bytes
            USING ERRCODE = 'string_data_right_truncation';
    END IF;
END
$$;

-- The size of a jsonb value as the C++ edition measures it (its data,
-- without the header).
CREATE FUNCTION idempotency.jsonb_bytes(value pg_catalog.jsonb)
RETURNS pg_catalog.int8
LANGUAGE sql IMMUTABLE
AS $$ SELECT pg_column_size(value)::int8 - 4 $$;

-- A finite interval in microseconds, or 22023.
CREATE FUNCTION idempotency.interval_arg(value pg_catalog.interval, name pg_catalog.text)
RETURNS pg_catalog.numeric
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    m numeric := idempotency.micros(value);
BEGIN
    IF m IS NULL THEN
        RAISE EXCEPTION '% is out of range (it must be a finite interval)', name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN m;
END
$$;

-- A lease, extension, ttl or wait: positive and at most idempotency.max_lease;
-- NULL: idempotency.default_lease (checked the same way). Returns it.
CREATE FUNCTION idempotency.lease_arg(value pg_catalog.interval, name pg_catalog.text)
RETURNS pg_catalog.interval
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    max_us numeric := idempotency.micros(
        idempotency.setting_interval('max_lease', interval '1 ms', interval '1 day'));
    lease interval := COALESCE(value,
        idempotency.setting_interval('default_lease', interval '1 ms', interval '30 s'));
    lease_us numeric;
BEGIN
    IF value IS NULL THEN
        name := 'idempotency.default_lease';
    END IF;
    lease_us := idempotency.interval_arg(lease, name);
    IF lease_us <= 0 OR lease_us > max_us THEN
        RAISE EXCEPTION '% must be positive and at most idempotency.max_lease (%)', name,
                        idempotency.format_duration(max_us)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN make_interval(secs => lease_us / 1000000);
END
$$;

-- A wait: NULL (no wait) or a lease-like interval.
CREATE FUNCTION idempotency.wait_arg(value pg_catalog.interval)
RETURNS pg_catalog.interval
LANGUAGE sql STABLE
AS $$ SELECT CASE WHEN value IS NOT NULL THEN idempotency.lease_arg(value, 'wait') END $$;

-- A retention or retry delay: 0 to 100 years (of 360 days); NULL stays NULL.
CREATE FUNCTION idempotency.span_arg(value pg_catalog.interval, name pg_catalog.text)
RETURNS pg_catalog.interval
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    m numeric;
BEGIN
    IF value IS NULL THEN
        RETURN NULL;
    END IF;
    m := idempotency.interval_arg(value, name);
    IF m < 0 OR m > 100::numeric * 12 * 30 * 86400000000 THEN
        RAISE EXCEPTION '% must be between 0 and 100 years (36000 days)', name USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN make_interval(secs => m / 1000000);
END
$$;

-- The backoff after `attempts` attempts: base doubled per attempt, capped,
-- the upper half jittered (as the C++ edition's core/retry.cpp).
CREATE FUNCTION idempotency.backoff(attempts pg_catalog.int4)
RETURNS pg_catalog.interval
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    base_us numeric := idempotency.micros(
        idempotency.setting_interval('retry_base_delay', interval '1 ms', interval '1 s'));
    max_us numeric := idempotency.micros(
        idempotency.setting_interval('retry_max_delay', interval '1 ms', interval '1 hour'));
    delay numeric;
    half numeric;
BEGIN
    IF base_us <= 0 OR max_us <= 0 THEN
        RETURN interval '0';
    END IF;
    delay := base_us;
    FOR n IN 1 .. attempts - 1 LOOP
        EXIT WHEN delay >= max_us;
        delay := CASE WHEN delay > trunc(max_us / 2) THEN max_us ELSE delay * 2 END;
    END LOOP;
    delay := least(delay, max_us);
    half := trunc(delay / 2);
    RETURN make_interval(secs => least(delay, half + trunc((delay - half) * random()::numeric)) / 1000000);
END
$$;

-- The role that called a SECURITY DEFINER function of the edition: the
-- role set with SET ROLE, else the session's user. (A function of another
-- role's calling in between is not seen through.)
CREATE FUNCTION idempotency.calling_role()
RETURNS pg_catalog.oid
LANGUAGE sql STABLE
AS $$
SELECT oid FROM pg_roles
 WHERE rolname = CASE WHEN current_setting('role') <> 'none' THEN current_setting('role')
                      ELSE session_user END
$$;

-- A call that would change a key or an event refuses a read-only
-- transaction and a hot standby with the C++ edition's error.
CREATE FUNCTION idempotency.refuse_read_only(call pg_catalog.text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF current_setting('transaction_read_only')::bool OR pg_is_in_recovery() THEN
        RAISE EXCEPTION 'idempotency: % would change the key, which a read-only transaction cannot', call
            USING ERRCODE = 'read_only_sql_transaction',
                  HINT = 'A duplicate of finished work is answered anywhere, also on a hot standby; '
                         'a call that creates or claims a key needs a read-write transaction on the primary.';
    END IF;
END
$$;

-- ---------------------------------------------------------------- fingerprints

-- A request with every number in its shortest form (1500.0 -> 1500), so
-- that requests equal as jsonb have one text.
CREATE FUNCTION idempotency.shortest_numbers(request pg_catalog.jsonb)
RETURNS pg_catalog.jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    CASE jsonb_typeof(request)
    WHEN 'number' THEN
        RETURN to_jsonb(trim_scale(request::numeric));
    WHEN 'array' THEN
        RETURN COALESCE((SELECT jsonb_agg(idempotency.shortest_numbers(e.value) ORDER BY e.n)
                           FROM jsonb_array_elements(request) WITH ORDINALITY AS e (value, n)),
                        '[]'::jsonb);
    WHEN 'object' THEN
        RETURN COALESCE((SELECT jsonb_object_agg(e.key, idempotency.shortest_numbers(e.value))
                           FROM jsonb_each(request) AS e),
                        '{}'::jsonb);
    ELSE
        RETURN request;
    END CASE;
END
$$;

-- A text's bytes as the server stores them (its encoding): what earlier
-- versions hashed. (A cast to bytea would read backslashes as escapes.)
CREATE FUNCTION idempotency.text_bytes(value pg_catalog.text)
RETURNS pg_catalog.bytea
LANGUAGE sql IMMUTABLE
AS $$ SELECT convert_to(value, current_setting('server_encoding')) $$;

-- The bytes every digest of text is taken over, as in the C++ edition: its
-- UTF-8 bytes, whatever the database's encoding (a dump restored into a
-- database of another encoding, and a client computing the digest in its
-- own language, agree); in a SQL_ASCII database, whose text has no declared
-- encoding, its bytes as they are (a conversion would refuse a byte that is
-- not valid UTF-8).
CREATE FUNCTION idempotency.digest_bytes(value pg_catalog.text)
RETURNS pg_catalog.bytea
LANGUAGE sql IMMUTABLE
AS $$
SELECT convert_to(value, CASE pg_catalog.getdatabaseencoding() WHEN 'SQL_ASCII' THEN 'SQL_ASCII'
                              ELSE 'UTF8' END)
$$;

-- The request's canonical text: jsonb's own layout, numbers in their
-- shortest form. Only a text with a decimal point can hold a number that
-- is not.
CREATE FUNCTION idempotency.canonical_text(request pg_catalog.jsonb)
RETURNS pg_catalog.text
LANGUAGE sql IMMUTABLE
AS $$
SELECT CASE WHEN strpos(request::text, '.') = 0 THEN request::text
            ELSE idempotency.shortest_numbers(request)::text END
$$;

-- The SHA-256 of the request's canonical text, as UTF-8 bytes.
CREATE FUNCTION idempotency.fingerprint(request pg_catalog.jsonb)
RETURNS pg_catalog.bytea
LANGUAGE sql IMMUTABLE
AS $$ SELECT sha256(idempotency.digest_bytes(idempotency.canonical_text(request))) $$;

-- Whether a stored fingerprint is of another request: neither the
-- canonical text's, nor a form an earlier version stored: the text as
-- written (before 0.4.0), the canonical text in the database's encoding
-- (before 0.7.0; the same bytes in a UTF-8 or SQL_ASCII database).
CREATE FUNCTION idempotency.fingerprint_differs(stored pg_catalog.bytea, fingerprint pg_catalog.bytea,
                                                request pg_catalog.jsonb)
RETURNS pg_catalog.bool
LANGUAGE sql IMMUTABLE
AS $$
SELECT stored IS NOT NULL AND fingerprint IS NOT NULL AND stored <> fingerprint
       AND stored <> sha256(idempotency.text_bytes(request::text))
       AND stored <> sha256(idempotency.text_bytes(idempotency.canonical_text(request)))
$$;
